"""The collective gate validate_nccl runs before training: each collective the layout runs, timed on its own
groups (patterns), the nodes' stack and settings (nodes), the ranks' NCCL environment (env), the verdict and its
exclude list (verdict), and the report nccl.json holds (report).

    python -m trainflow.stages.validate_nccl parallel=dp2_tp2   # the stage that runs it
"""
