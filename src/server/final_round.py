"""The round after the last: every collaborator audits the final global model against its own members.

OpenFL 1.9 sends a collaborator the global model only as the input of a task, and each round's tasks receive the
model that round starts from: the model aggregated at the end of the last round is saved by the aggregator and
received by no one. `FinalRound` wraps the plan's assigner (any of OpenFL's) and adds one round, after the plan's
`rounds_to_train`, whose only task is FINAL_AUDIT_TASK for every authorized collaborator: OpenFL then serves that
round's model (the final one) to each, as for any task, waits for every result under the plan's straggler policy,
logs the scalars, and ends the run. src.aggregator.AuditingAggregator counts the round in (rounds_to_train + 1) when
aggregator.settings.final_model_audit is true (the default); its report and callbacks leave it out of the training
rounds' files. Its task function is src.taskrunner.AuditedTaskRunner.final_model_audit_task.
"""

from __future__ import annotations

from src.plan.checks import FINAL_AUDIT_TASK

__all__ = ["FinalRound", "FINAL_AUDIT_TASK"]


class FinalRound:
    """The plan's assigner with one more round (`final_round`, = its rounds_to_train) whose only task is the final
    model's audit, for every authorized collaborator. Everything else is the plan's assigner's."""

    def __init__(self, assigner, task: str = FINAL_AUDIT_TASK):
        self._assigner = assigner
        self.final_round = int(assigner.rounds)
        self.final_tasks = [task]

    def __getattr__(self, name):  # what the aggregator reads of the assigner besides the methods below
        return getattr(self._assigner, name)

    def get_tasks_for_collaborator(self, collaborator_name, round_number):
        if round_number == self.final_round:
            return list(self.final_tasks) if collaborator_name in self._assigner.authorized_cols else []
        return self._assigner.get_tasks_for_collaborator(collaborator_name, round_number)

    def get_collaborators_for_task(self, task_name, round_number):
        if round_number == self.final_round:
            return list(self._assigner.authorized_cols) if task_name in self.final_tasks else []
        return self._assigner.get_collaborators_for_task(task_name, round_number)

    def get_all_tasks_for_round(self, round_number):
        if round_number == self.final_round:
            return list(self.final_tasks)
        return self._assigner.get_all_tasks_for_round(round_number)
