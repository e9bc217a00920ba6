from service.errors import Forbidden, Unauthorized


class MissingToken(Unauthorized):
    code = "missing_token"


class InvalidToken(Unauthorized):
    code = "invalid_token"


class WrongTokenKind(Forbidden):
    code = "wrong_token_kind"
