"""Checks of the plan as a whole, made before any work: the tasks and collaborators, the sections OpenFL builds its
own objects from, and the most of each count the data and the machine allow.
"""
