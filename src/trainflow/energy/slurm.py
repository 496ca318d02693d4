"""Slurm's own energy counter for a job: ConsumedEnergy from accounting (acct_gather_energy), read after the job.

    python -c "from trainflow.energy.slurm import consumed_energy; print(consumed_energy('12'))"

Only where the cluster runs slurmdbd and an `AcctGatherEnergyType` plugin (ipmi, rapl, gpu, pm_counters) does
`sacct` report a ConsumedEnergy; elsewhere the answer says which part is missing, and the report shows it.
"""

from __future__ import annotations

import re
import subprocess

from trainflow.errors import TrainflowError

FORMAT = "JobID,ConsumedEnergyRaw,ElapsedRaw,AllocTRES"
JOB_ID = r"\d+(_\d+)?"  # a job, or an array task


def consumed_energy(job_id: str | None) -> dict:
    """{"consumed_j", "elapsed_s", "alloc_tres", "status"}: consumed_j is None unless Slurm measured the job."""
    out = {"job_id": job_id, "consumed_j": None, "elapsed_s": None, "alloc_tres": None}
    if job_id is None:
        return {**out, "status": "not a Slurm job (local executor)"}
    if not re.fullmatch(JOB_ID, job_id):
        raise TrainflowError(f"slurm job id {job_id!r} is not a Slurm job id (digits, or digits_digits)")
    try:
        # A list argument, no shell: the id was checked above and reaches sacct as one word.
        done = subprocess.run(
            ["sacct", "-j", job_id, f"--format={FORMAT}", "--parsable2", "--noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        return {**out, "status": "not available: sacct is not installed here"}
    except subprocess.TimeoutExpired:
        return {**out, "status": "not available: sacct did not answer in 30 s"}
    if done.returncode:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
        return {**out, "status": f"not available: sacct failed ({why}); accounting needs slurmdbd"}
    rows = [line.split("|") for line in done.stdout.splitlines() if line.strip()]
    job = next((r for r in rows if r[0] == job_id), None)
    if job is None or len(job) < 4:
        return {**out, "status": f"not available: sacct has no record of job {job_id}"}
    _, energy, elapsed, tres = job[:4]
    out.update(elapsed_s=float(elapsed) if elapsed.isdigit() else None, alloc_tres=tres)
    if not energy.isdigit() or int(energy) == 0:
        return {**out, "status": "not configured: Slurm measured no energy (AcctGatherEnergyType is none)"}
    return {**out, "consumed_j": float(energy), "status": "measured"}
