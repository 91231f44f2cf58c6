"""`danube-admin` without a broker: how it lays out tables and JSON, how it reads its flags and
topic names, and which exit status each kind of failure gets (issue 10, point 2)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from grpclib import GRPCError
from grpclib.const import Status

from danube.cli import admin
from danube.cli.admin_args import topic_name
from danube.cli.admin_call import AdminClient, BadUsage, Refused, Unreachable
from danube.cli.admin_policies import policies_result, policy_changes
from danube.cli.admin_render import Result, cell, fields, plain, record, render, table
from danube.proto import danube_admin as pb


def parse(*argv: str) -> object:
    return admin.build_parser().parse_args(list(argv))


def test_table_aligns_columns_and_right_aligns_numbers() -> None:
    text = table(("name", "count"), [("a", 5), ("longer", 1234)], "nothing")
    assert text.splitlines() == [
        "NAME    COUNT",
        "a           5",
        "longer   1234",
    ]


def test_an_empty_table_says_what_there_is_none_of() -> None:
    assert table(("topic",), [], "no topics in orders") == "no topics in orders"


def test_cells_show_absent_values_lists_and_booleans_readably() -> None:
    assert [cell(None), cell(""), cell(["a", "b"]), cell([]), cell(True), cell(0.25)] == [
        "-", "-", "a, b", "-", "yes", "0.25",
    ]  # fmt: skip


def test_fields_align_names() -> None:
    assert fields([("topic", "/a/b"), ("schema_id", None)]).splitlines() == [
        "topic:     /a/b",
        "schema_id: -",
    ]


def test_json_keeps_64_bit_ids_as_numbers_and_enums_as_flag_names() -> None:
    """Proto3's JSON mapping would turn the broker id into a string and the poison policy into
    `DeadLetter`; scripts get the number and the spelling the flags take."""
    balance = pb.ClusterBalanceResponse(brokers=[pb.BrokerLoadInfo(broker_id=2**63 + 1)])
    policy = pb.SubscriptionFailurePolicy(poison_policy=pb.SubscriptionPoisonPolicy.DeadLetter)
    assert plain(balance)["brokers"][0]["broker_id"] == 2**63 + 1  # type: ignore[index]
    found = plain(policy)
    assert isinstance(found, dict)
    assert found["poison_policy"] == "dead_letter"
    assert found["backoff_strategy"] == "fixed"
    assert found["dead_letter_topic"] is None


def test_cluster_balance_json_keeps_the_load_field() -> None:
    """BrokerLoadInfo's `load` field hides betterproto's Message.load (danube.proto_compat
    repairs parsing, imported by `danube.cli.admin`); JSON keeps the proto's name."""
    sent = pb.ClusterBalanceResponse(
        broker_count=2,
        brokers=[pb.BrokerLoadInfo(broker_id=7, load=2.5, topic_count=3, is_overloaded=True)],
        assignment_strategy="Fair",
    )
    answer = record(pb.ClusterBalanceResponse().parse(bytes(sent)))
    assert answer["broker_count"] == 2 and answer["assignment_strategy"] == "Fair"
    assert answer["brokers"] == [
        {"broker_id": 7, "load": 2.5, "topic_count": 3, "is_overloaded": True,
         "is_underloaded": False}
    ]  # fmt: skip


def test_json_output_is_one_document_with_sorted_keys() -> None:
    result = Result({"b": 1, "a": [1, 2]}, "people's text")
    out = render(result, "json")
    assert json.loads(out) == {"a": [1, 2], "b": 1}
    assert out.index('"a"') < out.index('"b"')
    assert render(result, "table") == "people's text"


@pytest.mark.parametrize(
    ("given", "namespace", "expected"),
    [
        ("/orders/t1", None, "/orders/t1"),
        ("t1", None, "/default/t1"),
        ("t1", "orders", "/orders/t1"),
        ("/orders/t1", "orders", "/orders/t1"),
    ],
)
def test_topic_names_resolve_as_danube_does(
    given: str, namespace: str | None, expected: str
) -> None:
    args = parse("topics", "describe", given, *(("--namespace", namespace) if namespace else ()))
    assert topic_name(args) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "namespace"), [("/orders", None), ("a/b", None), ("/x/t", "orders"), ("/a/b/c", None)]
)
def test_bad_topic_names_are_usage_errors(given: str, namespace: str | None) -> None:
    args = parse("topics", "describe", given, *(("-n", namespace) if namespace else ()))
    with pytest.raises(BadUsage):
        topic_name(args)  # type: ignore[arg-type]


def test_output_is_accepted_before_and_after_the_command() -> None:
    assert parse("brokers", "list").output == "table"  # type: ignore[attr-defined]
    assert parse("--output", "json", "brokers", "list").output == "json"  # type: ignore[attr-defined]
    assert parse("brokers", "list", "--output", "json").output == "json"  # type: ignore[attr-defined]


def test_brokers_unload_timeout_is_not_the_call_timeout() -> None:
    args = parse("--timeout", "3", "brokers", "unload", "--broker-id", "7", "--timeout", "90")
    assert (args.timeout, args.unload_timeout, args.max_parallel) == (3.0, 90, 1)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "argv",
    [
        ["topics", "list"],  # --namespace or --broker is required
        ["topics", "list", "-n", "a", "-b", "1"],  # not both
        ["topics", "create", "t", "--partitions", "-1"],
        ["topics", "create", "t", "--dispatch-strategy", "sometimes"],
        ["namespaces", "set-policies", "ns", "--max-producers-per-topic", "many"],
        ["brokers", "frobnicate"],
        ["--timeout", "0", "brokers", "list"],
    ],
)
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        admin.main(argv)
    assert stopped.value.code == 2
    assert "usage: danube-admin" in capsys.readouterr().err


def test_set_policies_sends_only_the_fields_given() -> None:
    args = parse("topics", "set-policies", "t", "--max-producers-per-topic", "2",
                 "--max-message-size", "0")  # fmt: skip
    assert json.loads(policy_changes(args)) == {  # type: ignore[arg-type]
        "max_producers_per_topic": 2,
        "max_message_size": 0,
    }


def test_namespace_set_policies_takes_a_default_failure_policy() -> None:
    args = parse("namespaces", "set-policies", "ns", "--failure-policy",
                 '{"max_redelivery_count": 3, "poison_policy": "drop"}')  # fmt: skip
    assert json.loads(policy_changes(args)) == {  # type: ignore[arg-type]
        "failure_policy": {"max_redelivery_count": 3, "poison_policy": "drop"}
    }
    cleared = parse("namespaces", "set-policies", "ns", "--failure-policy", "null")
    assert json.loads(policy_changes(cleared)) == {"failure_policy": None}  # type: ignore[arg-type]
    with pytest.raises(SystemExit):  # a namespace default only
        parse("topics", "set-policies", "t", "--failure-policy", "{}")


def test_set_policies_without_a_field_is_a_usage_error_naming_the_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert admin.main(["namespaces", "set-policies", "orders"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "nothing to change" in err and "--max-producers-per-topic" in err


def test_topic_policies_show_where_each_value_comes_from() -> None:
    result = policies_result(
        "x", '{"max_producers_per_topic": 1, "max_message_size": 0}', ["max_producers_per_topic"]
    )
    assert result.text.splitlines() == [
        "POLICY                   VALUE      SOURCE",
        "max_message_size         unlimited  namespace",
        "max_producers_per_topic  1          topic",
    ]
    assert result.data == {
        "policies": {"max_producers_per_topic": 1, "max_message_size": 0},
        "overridden": ["max_producers_per_topic"],
    }


def test_schema_delete_needs_confirm(capsys: pytest.CaptureFixture[str]) -> None:
    assert admin.main(["schemas", "delete", "orders", "--version", "1"]) == 2
    assert "--confirm" in capsys.readouterr().err


def test_a_refusal_names_the_call_the_status_and_the_message() -> None:
    async def refuse() -> None:
        raise GRPCError(Status.NOT_FOUND, "namespace 'nope' not found")

    async def ask() -> None:
        client = AdminClient("http://127.0.0.1:1", 1.0)
        try:
            await client.call("topics of nope", refuse())
        finally:
            client.close()

    with pytest.raises(Refused) as refused:
        asyncio.run(ask())
    assert str(refused.value) == "topics of nope: NOT_FOUND: namespace 'nope' not found"
    assert refused.value.exit_code == 1


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_endpoint_exits_3_saying_how_to_set_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    assert admin.main(["--endpoint", endpoint, "namespaces", "create", "x"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("danube-admin: error: create namespace x: cannot reach")
    assert endpoint in err and "DANUBE_ADMIN_ENDPOINT" in err
    assert Unreachable.exit_code == 3


def test_an_invalid_endpoint_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert admin.main(["--endpoint", "nowhere", "brokers", "list"]) == 2
    assert "invalid broker address" in capsys.readouterr().err


@pytest.mark.parametrize("shell", ["bash", "zsh", "tcsh"])
def test_completion_scripts_cover_the_commands(
    shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert admin.main(["completion", shell]) == 0
    script = capsys.readouterr().out
    assert "danube-admin" in script
    for word in ("brokers", "namespaces", "set-failure-policy", "list-subjects"):
        assert word in script
