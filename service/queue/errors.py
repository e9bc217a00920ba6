from service.errors import Conflict, Forbidden, Invalid, NotFound


class TaskNotFound(NotFound):
    code = "task_not_found"


class LeaseLost(Conflict):
    """The task is no longer the caller's: lease expired and reaped, cancelled, or reassigned."""

    code = "lease_lost"


class ResultAlreadyAccepted(Conflict):
    code = "result_already_accepted"


class WrongTaskKind(Invalid):
    code = "wrong_task_kind"


class ResultMismatch(Invalid):
    code = "result_mismatch"


class NotTaskHolder(Forbidden):
    code = "not_task_holder"


class PlanNotFound(NotFound):
    code = "plan_not_found"
