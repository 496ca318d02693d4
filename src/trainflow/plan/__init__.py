"""The analytic model of a training step: what one device holds (memory) and how its peak is measured on
the CPU (peak). A planner (`python -m trainflow.plan`, to come) builds on it to size layouts before a job
is submitted; nothing here but peak.py imports torch.
"""
