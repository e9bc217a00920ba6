"""One way to change a state in the service: ``service.events.transitions.transition``, read from the source.

It checks the move against ``schemas.states.TRANSITIONS``, sets the row's state and records its event in
the same session. Any other ``<row>.state = ...`` (or ``+=``) in ``service/`` fails here. The bulk
``UPDATE ... SET state = ...`` statements that move many rows in one round trip are listed below with the
reason each exists; they check the table with ``advance``/``advance_each`` and record their own event.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRANSITION_MODULE = "service/events/transitions.py"

# (module, function) -> why the state of many rows is set by one UPDATE rather than row by row.
BULK_STATE_UPDATES = {
    ("service/queue/claim.py", "_claim_statement"): (
        "a claim hands out a batch of queued realisations in one statement (one round trip per claim)"
    ),
    ("service/queue/plans.py", "take_build"): (
        "a failed plan becomes a build with an optimistic UPDATE, so only one of several claimers wins it"
    ),
    ("service/campaigns/lifecycle.py", "fail_unfinished"): (
        "cancelling a campaign moves every unfinished realisation, whatever their number, in one statement"
    ),
    ("service/campaigns/lifecycle.py", "retry_failed"): (
        "a retry puts every failed realisation of a campaign back in the queue in one statement"
    ),
}


def state_assignments(path: Path) -> list[int]:
    """Lines of ``path`` assigning to an attribute named ``state`` (``x.state = ...``, ``a, x.state = ...``, ``+=``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        while targets:
            target = targets.pop()
            if isinstance(target, (ast.Tuple, ast.List)):
                targets.extend(target.elts)
            elif isinstance(target, ast.Attribute) and target.attr == "state":
                lines.append(node.lineno)
    return lines


def bulk_state_updates(path: Path) -> set[str]:
    """Functions of ``path`` that build ``update(...)...values(state=...)``: an UPDATE setting many rows' state."""
    found = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "values"
                and any(keyword.arg == "state" for keyword in node.keywords)
            ):
                continue
            statement = node.func.value
            while isinstance(statement, ast.Call) and isinstance(statement.func, ast.Attribute):
                statement = statement.func.value
            if isinstance(statement, ast.Call) and isinstance(statement.func, ast.Name) and statement.func.id == "update":
                found.add(function.name)
    return found


def test_only_the_transition_function_assigns_a_state():
    wrong = []
    for path in sorted((REPO / "service").rglob("*.py")):
        module = str(path.relative_to(REPO))
        if module != TRANSITION_MODULE:
            wrong.extend(f"{module}:{line}" for line in state_assignments(path))
    assert wrong == [], "a state set outside service.events.transitions.transition:\n" + "\n".join(wrong)


def test_the_transition_function_does_assign_it():
    """The exemption is not vacuous: the one module allowed to assign a state does."""
    assert state_assignments(REPO / TRANSITION_MODULE)


def test_bulk_state_updates_are_the_listed_ones():
    """A new bulk UPDATE of states must be listed with its reason; a listed one that stopped must be dropped."""
    found = {
        (str(path.relative_to(REPO)), function)
        for path in sorted((REPO / "service").rglob("*.py"))
        for function in bulk_state_updates(path)
    }
    assert found == set(BULK_STATE_UPDATES)


def test_the_readers_find_each_spelling(tmp_path):
    """The checks would pass vacuously if a spelling were missed; inserts and plain variables are not states."""
    module = tmp_path / "probe.py"
    module.write_text(
        "def move(row, other, session):\n"
        "    row.state = 'running'\n"
        "    row.state += 'x'\n"
        "    other.name, row.state = 'a', 'b'\n"
        "    state = 'queued'\n"
        "    row.states = state\n"
        "    session.execute(insert(T).values(state='queued'))\n"
        "\n"
        "def bulk(session):\n"
        "    session.execute(update(T).where(T.id == 1).values(state='failed'))\n"
    )
    assert state_assignments(module) == [2, 3, 4]
    assert bulk_state_updates(module) == {"bulk"}
