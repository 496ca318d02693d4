"""trainflow: a declarative Snakemake workflow for LLM training campaigns on Slurm."""
