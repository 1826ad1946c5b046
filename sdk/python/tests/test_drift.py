"""The SDK against docs/api/openapi.json (the spec generated from the server): every operation of the spec is one the
SDK declares (`_operations.OPERATIONS`) unless the allowlist below says why not, every declared operation is in the
spec, and every declared operation is named by a public method (`@uses`) of the sync and of the async surface. The
conftest's session check then proves each was really called. Needs no server."""

from __future__ import annotations

import inspect
import json
import os
from typing import Dict, Iterable, Set, Tuple

import sandkasten
from sandkasten._operations import OPERATIONS

#: Operations of the spec the SDK leaves out on purpose, each with its reason.
NOT_IN_SDK: Dict[Tuple[str, str], str] = {
    ("GET", "/healthz"): "liveness probe for load balancers, not an API call an agent makes",
    ("GET", "/metrics"): "Prometheus text for the operator's scraper",
    ("GET", "/openapi.json"): "the spec itself, which this test reads from the repository",
    **{
        (method, "/v1/sandboxes/{id}/ports/{port}/{path}"): "forwards any HTTP request (or WebSocket) to a server in "
        "the sandbox: callers speak that server's own protocol with their HTTP library, not an SDK call"
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")
    },
}

SPEC = os.environ.get(
    "SANDKASTEN_OPENAPI",
    os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "api", "openapi.json"),
)

SYNC = [
    sandkasten.Sandbox,
    sandkasten.Files,
    sandkasten.Commands,
    sandkasten.CommandHandle,
    sandkasten.Contexts,
    sandkasten.Client,
    sandkasten.Snapshots,
    sandkasten.Secrets,
    sandkasten.Pools,
    sandkasten.Templates,
]
ASYNC = [
    sandkasten.AsyncSandbox,
    sandkasten.AsyncFiles,
    sandkasten.AsyncCommands,
    sandkasten.AsyncCommandHandle,
    sandkasten.AsyncContexts,
    sandkasten.AsyncClient,
    sandkasten.AsyncSnapshots,
    sandkasten.AsyncSecrets,
    sandkasten.AsyncPools,
    sandkasten.AsyncTemplates,
]


def spec_operations() -> Set[Tuple[str, str]]:
    with open(SPEC) as file:
        spec = json.load(file)
    methods = {"get", "put", "post", "delete", "patch", "head", "options"}
    return {(method.upper(), path) for path, item in spec["paths"].items() for method in item if method in methods}


def declared(classes: Iterable[type]) -> Dict[str, Set[str]]:
    """Operation name → the public methods that say they use it."""
    users: Dict[str, Set[str]] = {}
    for cls in classes:
        for name, member in inspect.getmembers(cls):
            if name.startswith("_") and name not in ("__enter__", "__exit__", "__aenter__", "__aexit__"):
                continue
            function = getattr(member, "__func__", member)
            for operation in getattr(function, "__sandkasten_operations__", ()):
                users.setdefault(operation, set()).add(f"{cls.__name__}.{name}")
    return users


def test_every_spec_operation_is_in_the_sdk() -> None:
    table = {(operation.method, operation.path) for operation in OPERATIONS.values()}
    missing = sorted(spec_operations() - table - set(NOT_IN_SDK))
    assert not missing, f"the spec has operations the SDK does not cover (add them, or to NOT_IN_SDK): {missing}"


def test_every_sdk_operation_is_in_the_spec() -> None:
    spec = spec_operations()
    unknown = sorted(
        f"{op.name}: {op.method} {op.path}" for op in OPERATIONS.values() if (op.method, op.path) not in spec
    )
    assert not unknown, f"the SDK calls operations docs/api/openapi.json lacks: {unknown}"


def test_the_allowlist_names_only_spec_operations() -> None:
    stale = sorted(set(NOT_IN_SDK) - spec_operations())
    assert not stale, f"NOT_IN_SDK lists operations the spec no longer has: {stale}"


def test_operations_are_unique() -> None:
    pairs = [(operation.method, operation.path) for operation in OPERATIONS.values()]
    assert len(pairs) == len(set(pairs)), "two SDK operation names map to one spec operation"


def test_sync_and_async_surfaces_each_use_every_operation() -> None:
    for surface, classes in (("sync", SYNC), ("async", ASYNC)):
        users = declared(classes)
        unused = sorted(set(OPERATIONS) - set(users))
        assert not unused, f"no public {surface} method declares these operations: {unused}"


def test_async_surface_mirrors_the_sync_one() -> None:
    def shape(classes: Iterable[type]) -> Set[Tuple[str, str]]:
        return {
            (method.split(".")[-1], operation)
            for operation, methods in declared(classes).items()
            for method in methods
            if not method.endswith(("__enter__", "__exit__", "__aenter__", "__aexit__"))
        }

    assert shape(SYNC) == shape(ASYNC)


def test_async_methods_take_the_sync_methods_parameters() -> None:
    """The async modules are kept in step with the sync ones by hand: same public methods, same parameters."""
    for sync_cls, async_cls in zip(SYNC, ASYNC):
        assert async_cls.__name__ == "Async" + sync_cls.__name__
        public = {name for name in vars(sync_cls) if not name.startswith("_")}
        assert public == {name for name in vars(async_cls) if not name.startswith("_")}, sync_cls.__name__
        for name in public:
            sync_member, async_member = getattr(sync_cls, name), getattr(async_cls, name)
            if isinstance(sync_member, property) or not callable(sync_member):
                continue
            expected = [(p.name, p.kind, p.default) for p in inspect.signature(sync_member).parameters.values()]
            actual = [(p.name, p.kind, p.default) for p in inspect.signature(async_member).parameters.values()]
            assert actual == expected, f"{async_cls.__name__}.{name} takes other parameters than {sync_cls.__name__}'s"
