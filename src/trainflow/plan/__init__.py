"""The analytic model of a training run before it is submitted: what one device holds (memory, fit), where a
step's seconds go (step, collectives), the checkpoint interval and energy (campaign), the seed's remedies
(remedies, seed), all assembled by build and printed by table; a campaign's phases, each planned so, and their total
(phases); and how a step's peak is measured on the CPU (peak). Nothing here but peak.py imports torch.

    python -m trainflow.plan experiment=llama70b_alps train.precision=bf16 train.activations=recompute
"""
