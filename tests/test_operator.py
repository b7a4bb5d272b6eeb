"""`Operations` (against the database) and `RemoteClient` (over HTTP) both implement the
`Operator` Protocol the CLI holds: every operation, with parameters it can be called with.
mypy checks the same statically (`_both_implement` in herder/services/operator.py)."""

from __future__ import annotations

import inspect

import pytest

from herder.client import Client
from herder.services.operations import Operations
from herder.services.operator import Operator
from herder.services.remote import RemoteClient

OPERATIONS = [name for name, member in vars(Operator).items()
              if callable(member) and not name.startswith("_")]


def test_the_protocol_lists_every_operation():
    assert {"submit", "get", "why", "hosts", "cancel", "retry", "reserve", "claim_slot",
            "account_add", "fleet_cap_set", "alerts", "wait", "close"} <= set(OPERATIONS)


@pytest.mark.parametrize("implementation", [Operations, RemoteClient])
@pytest.mark.parametrize("name", OPERATIONS)
def test_an_implementation_takes_each_operation_as_the_protocol_declares_it(implementation,
                                                                            name):
    declared = inspect.signature(getattr(Operator, name)).parameters
    given = inspect.signature(getattr(implementation, name)).parameters
    for parameter in declared.values():
        assert parameter.name in given, f"{implementation.__name__}.{name}: {parameter.name}"
        found = given[parameter.name]
        assert found.kind == parameter.kind, f"{implementation.__name__}.{name}: {found}"
        assert found.default == parameter.default, f"{implementation.__name__}.{name}: {found}"
    # what the protocol does not declare (the server's token and cap) is optional
    extra = [p for p in given.values() if p.name not in declared]
    assert all(p.default is not inspect.Parameter.empty
               or p.kind is inspect.Parameter.VAR_KEYWORD for p in extra), extra


def test_the_documented_client_is_the_operations_service():
    assert Client is Operations
