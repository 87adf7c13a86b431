"""The tools around training: the script entry points (cli.py maps their errors to one line
and an exit code), evaluation reports, prediction, export and run comparison.  # feature: export
and an exit code), evaluation reports, prediction and run comparison.  # feature: !export

They import the training core (config, data, models, tasks, trainer, loop, checkpoint,
distributed); the core never imports them.
"""
