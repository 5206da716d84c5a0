"""The packages' modules import one way, lazy imports inside functions included.

A cycle hidden in a function body (`from slicewise.silver import ...` inside gate_facts)
works at run time but means two modules each need the other: the code no longer reads
top-down and neither can be understood or tested alone. Beyond no cycles, the product
package is layered: foundations, then the data path in its order (plan -> bronze ->
silver -> gate -> publish), then what wires it; a module imports only layers below
its own, and nothing in it imports the dev stack (`slicewise_dev`).
"""

from __future__ import annotations

import ast
from pathlib import Path

INCLUDE = Path(__file__).resolve().parents[2] / "include"
PACKAGE = INCLUDE / "slicewise"
DEV_STACK = INCLUDE / "slicewise_dev"

# Bottom to top. A new module must be placed here: the test names it until it is.
LAYERS: list[set[str]] = [
    {"slicewise", "errors", "home"},  # the bases: the errors a person acts on, where files live
    {"slices", "holds", "tables", "gx_adapter", "kafka", "connect_auth", "avro", "class_archive"},
    {"commits"},  # which slices a commit to silver wrote for
    {"schema_registry"},
    {"freshness"},
    {"kafka.security", "pipelines"},
    {"config", "schemas"},  # schemas: every table's, in one place
    {"store", "contract"},
    {"lease"},  # the planning lease, kept in the ledger's store
    {"data_docs"},  # the gate's pages, kept in the lakehouse's store
    {"faults", "spark", "kafka.offsets", "kafka.consumer_group", "ledger", "transforms"},
    {"coverage"},  # which offsets the slices own, from the origin on
    {"key_index"},  # where earlier slices recorded a slice's keys, in runs sorted by key
    {"windows"},  # a slice's reach in silver: what silver merged, the gate and publish read
    {"planner"},  # the data path, in its order
    {"bronze"},
    {"silver"},
    {"ingest"},  # bronze and silver from one Kafka read
    {"gate_facts"},  # what the gate proves, from the tables
    {"replay"},
    {"gate"},
    {"acknowledge"},  # publish's last act: the consumer group
    {"publish", "maintenance"},  # maintenance: beside the data path, on its own schedule
    {"assets", "lineage"},
    {"jobs", "connect_server"},  # what runs the steps
    {"operators", "cli"},
    {"preloaded_scheduler"},  # imports the steps ahead of Airflow's forks
]


def module_name(path: Path) -> str:
    parts = path.relative_to(INCLUDE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports anywhere in its body (TYPE_CHECKING too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from slicewise.kafka import offsets` imports the module slicewise.kafka.offsets
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of both packages it imports."""
    files = {module_name(p): p for root in (PACKAGE, DEV_STACK) for p in root.rglob("*.py")}
    known = set(files)
    return {name: imports_of(path, known) - {name} for name, path in files.items()}


def layer_violations(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    """Each import of the product package that does not go to a lower layer, and each
    product module no layer names."""
    level = {
        f"slicewise.{m}" if m != "slicewise" else m: i for i, ms in enumerate(layers) for m in ms
    }
    product = {m for m in graph if m == "slicewise" or m.startswith("slicewise.")}
    found = [f"{m} is in no layer of LAYERS" for m in sorted(product - set(level))]
    for module in sorted(product & set(level)):
        for target in sorted(graph[module]):
            if target not in level:  # the dev stack, or a module placed nowhere
                found.append(f"{module} imports {target}, which is not in the product's layers")
            elif level[target] >= level[module]:
                found.append(
                    f"{module} (layer {level[module]}) imports {target} (layer {level[target]})"
                )
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle found by depth-first search, each once (rotated to its minimum)."""
    found: set[tuple[str, ...]] = set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                loop = path[path.index(nxt) :]
                i = loop.index(min(loop))
                found.add(tuple(loop[i:] + loop[:i]))
            elif len(path) < len(graph):
                visit(nxt, [*path, nxt])

    for start in sorted(graph):
        visit(start, [start])
    return [list(c) for c in sorted(found)]


def test_the_graph_sees_lazy_imports() -> None:
    """The check itself: a function-level import is an edge (else it could not fail)."""
    graph = import_graph()
    assert "slicewise.silver" in graph["slicewise.jobs"]  # imported inside a function there
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_layer_check_bites() -> None:
    graph = {"slicewise.config": set(), "slicewise.silver": {"slicewise.config"}}
    assert layer_violations(graph, [{"config"}, {"silver"}]) == []
    assert layer_violations(graph, [{"silver"}, {"config"}]) == [
        "slicewise.silver (layer 0) imports slicewise.config (layer 1)"
    ]
    graph["slicewise.silver"].add("slicewise_dev.broker")
    assert (
        "slicewise.silver imports slicewise_dev.broker, which is not in the product's layers"
        in (layer_violations(graph, [{"config"}, {"silver"}]))
    )
    assert layer_violations({"slicewise.new": set()}, []) == [
        "slicewise.new is in no layer of LAYERS"
    ]


def test_the_product_imports_down_its_layers_and_never_the_dev_stack() -> None:
    graph = import_graph()
    assert any(m.startswith("slicewise_dev.") for m in graph)  # both packages are read
    found = layer_violations(graph, LAYERS)
    assert not found, "\n".join(found)


def test_every_product_module_is_one_a_deployment_runs() -> None:
    """Reached from what a deployment starts (the DAG files, the Spark jobs, the
    `slicewise` CLI, the Spark Connect server and the scheduler launcher): a module
    only tests, the demo or the bench use belongs in the dev stack."""
    graph = import_graph()
    known = set(graph)
    roots = {"slicewise.cli", "slicewise.connect_server", "slicewise.preloaded_scheduler"}
    for folder in ("dags", "spark_jobs"):
        for path in (INCLUDE.parent / folder).glob("*.py"):
            roots |= imports_of(path, known)
    reached, todo = set(), list(roots)
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph[module])
    packages = {"slicewise", "slicewise.kafka"}
    product = {m for m in known if m.startswith("slicewise.")} - packages
    assert "slicewise.silver" in reached and not any(m.startswith("slicewise_dev") for m in reached)
    assert product - reached == set(), f"used by no deployment: {sorted(product - reached)}"


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join([*c, c[0]]) for c in found)
