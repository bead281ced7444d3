"""The task runner's parts (the runner OpenFL loads stays at `src.taskrunner`, the plan names it): its plan
settings, the compute device, the models it trains and the tasks of a round whose received model is rejected.
"""
