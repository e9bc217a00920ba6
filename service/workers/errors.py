from service.errors import Forbidden, NotFound


class WorkerNotFound(NotFound):
    code = "worker_not_found"


class WorkerTokenMismatch(Forbidden):
    code = "worker_token_mismatch"
