"""Resilience: the records and policies of failures, below the launcher (launch/) and the training loop (train/), which
only wire them. Nothing here imports torch.

    python -c "from trainflow.resilience.ledger import standing; print(standing([]))"

- ledger: the run's jobs ledger (jobs.jsonl: every job, failure, blamed host, verdict), its hosts ledger (hosts.jsonl:
  a blamed host's hold and return) and where the run stands by them (the hosts out, the restarts without progress);
- probation: when a blamed host comes back, from Slurm's record of the node (parsed strictly);
- timing: each rank's forward time and the stragglers, one measure for the restart and the report;
- hang: a hung job's report, and the evidence that names the rank the others wait for, or nobody;
- evidence: what a failed job's host says of its own GPUs (kernel log Xids, NVML, Slurm), parsed strictly;
- verdict: a failed job's facts, its class, whether a new job may fix it, and which hosts it leaves out.
- goodput: where a segment's wall time went, by term, from the jobs ledger and rank 0's spans (spans.jsonl);
- arrivals: the failure drill's seeded Poisson process on the campaign's clock, and its ledger (faults.jsonl).
"""
