"""The campaign report's parts: the plots (plots), the seed's tuning checklist (checklist) and one function per
`##` section of report.md returning its lines (sections, energy); the report stage reads the inputs, draws and joins.

    python -m trainflow.stages.report   # runs/default/report/report.md and its plots
"""
