#!/usr/bin/env bash
# Fail in one line, before an install starts, where the disk holding FOLDER has less than GB gigabytes free: pip
# stopping half-way with "No space left on device" leaves a broken environment behind (a shared disk filled by other
# checkouts made CI fail that way).
#   bash scripts/need_disk.sh GB FOLDER WHAT
set -euo pipefail
need=$1 folder=$2 what=$3
free=$(df --output=avail -B1G "$folder" | tail -1 | tr -d ' ')
if [ "$free" -lt "$need" ]; then
  echo "$what needs about $need GB free on the disk of $folder, which has $free GB: free some space (old clones, other" \
    "checkouts' .venv and .venv-torch211, /tmp/pytest-of-$(id -un)) and rerun" >&2
  exit 1
fi
