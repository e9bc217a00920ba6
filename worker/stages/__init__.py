"""The three stages of one claimed task, each a module that takes the facts of the stage before as values.

* :mod:`worker.stages.prepare` -- where the task's files go at this site (:class:`~worker.stages.prepare.Placement`),
  whether it can run here at all, its fresh work folder, and what to hand to Parsl
  (:class:`~worker.stages.prepare.PreparedTask`);
* :mod:`worker.stages.run` -- the Parsl submission, the work folder shared with the task runner
  (:class:`~worker.stages.run.WorkFolder`: liveness, cancel, removal), and how the task ended
  (:class:`~worker.stages.run.EndedTask`);
* :mod:`worker.stages.report` -- from an :class:`~worker.stages.run.EndedTask` to the service: products checked
  and uploaded, the result, a built plan or a failure reported (:class:`~worker.stages.report.Reported`), and
  what the task leaves behind tidied.

:class:`worker.tasks.TaskRun` strings them together for the loop (:mod:`worker.agent`), and holds the one thing
that changes while a task runs: what the loop has asked of it (stop, report).
"""
