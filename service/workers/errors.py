from service.errors import Conflict, Forbidden, NotFound


class WorkerNotFound(NotFound):
    code = "worker_not_found"


class WorkerTokenMismatch(Forbidden):
    code = "worker_token_mismatch"


class WorkerNameTaken(Conflict):
    """Another user's worker token registered this name: re-registering would hand its tasks over."""

    code = "worker_name_taken"
