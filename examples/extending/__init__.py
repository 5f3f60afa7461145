"""Worked plug-ins for docs/EXTENDING.md: a loss, an advantage estimator, rewards, a rollout backend, tools.

Put the folder that holds ``extending/`` on the Python path (``PYTHONPATH=examples``) and name a plug-in
as ``"extending.my_loss:cpi_loss"`` in a recipe, or import the module so its decorators register it.
"""
