"""One rule for where an error class lives (`slicewise.errors`): with the module that
raises it. An error several modules raise lives in a module all of them import (the
model it reports on, as `slices.DataLossError`), never beside an unrelated caller.
And each is one a person acts on (a `ConfigError` or an `OperationalError`, whose
message gives the safe action) unless it is listed below as a fault of the system."""

from __future__ import annotations

import ast
import functools

from test_import_graph import PACKAGE, import_graph, module_name

# Errors that are not a person's to act on from the message alone.
SYSTEM_FAULTS = {
    "InjectedFault",  # the chaos suite's strike
    "ConnectServerError",  # the Spark Connect server did not start: its log says why
}
BASES = {"ConfigError", "OperationalError"}


@functools.cache
def trees() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}


def error_classes() -> dict[str, tuple[str, list[str]]]:
    """Every exception class of the product: name -> (module, its bases' names)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for module, tree in trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                found[node.name] = (module, bases)
    known = {"Exception", "RuntimeError", "ValueError", "LookupError"}
    errors: dict[str, tuple[str, list[str]]] = {}
    while True:  # a subclass of an error is an error
        more = {n: v for n, v in found.items() if n not in errors and set(v[1]) & known}
        if not more:
            return errors
        errors |= more
        known |= set(more)


def constructing_modules(name: str) -> set[str]:
    """Modules that build an instance of `name`: `Name(...)` or `Name.factory(...)`."""
    found = set()
    for module, tree in trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func.value if isinstance(node.func, ast.Attribute) else node.func
                if isinstance(func, ast.Name) and func.id == name:
                    found.add(module)
    return found


def test_the_scan_finds_the_errors_and_their_raisers() -> None:
    errors = error_classes()
    assert errors["OperationalError"][0] == "slicewise.errors"
    assert errors["PipelineDefinitionError"] == ("slicewise.pipelines", ["ConfigError"])
    assert "slicewise.bronze" in constructing_modules("DataLossError")  # via its factory


def test_every_error_lives_with_the_module_that_raises_it() -> None:
    graph = import_graph()
    misplaced = []
    for name, (home, _) in sorted(error_classes().items()):
        if name in BASES:
            continue
        raisers = constructing_modules(name)
        assert raisers, f"{name} is raised nowhere"
        if raisers == {home}:
            continue
        others = raisers - {home}
        if len(raisers) == 1 or any(home not in graph[m] for m in others):
            misplaced.append(f"{name} is defined in {home} but raised by {sorted(raisers)}")
    assert not misplaced, "\n".join(misplaced)


def test_every_error_is_one_a_person_acts_on_or_a_listed_system_fault() -> None:
    errors = error_classes()
    unlisted = [
        f"{name} ({home}) derives from {bases}"
        for name, (home, bases) in sorted(errors.items())
        if name not in BASES | SYSTEM_FAULTS and not _derives_from_a_base(name, errors)
    ]
    assert not unlisted, "\n".join(unlisted)
    assert SYSTEM_FAULTS <= set(errors), "a listed fault no longer exists"


def _derives_from_a_base(name: str, errors: dict[str, tuple[str, list[str]]]) -> bool:
    bases = errors[name][1]
    return bool(set(bases) & BASES) or any(
        _derives_from_a_base(b, errors) for b in bases if b in errors
    )
