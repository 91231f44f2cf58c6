"""The web console in a real headless browser (Debian's chromium through chromedriver and
selenium) against a real three-broker LocalCluster (issue 26 point 4): each page loads, its
numbers match the admin API, the charts move with real traffic, and actions take effect
(delete through the confirmation dialog; a refused action shows the CLI's message).

Screenshots of the pages go to $DANUBE_CONSOLE_SCREENSHOTS when it is set (spec/console/ was
made so), else to the test's temporary directory."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from danube.admin_mcp.tools import admin_tools
from danube.cli.admin import build_parser
from danube.cli.admin_call import AdminError
from danube.localcluster.cluster import ClusterSettings, LocalCluster
from tests.console.support import ConsoleServer

pytestmark = pytest.mark.slow
CLI = str(Path(sys.executable).with_name("danube-cli"))
TOOLS = {tool.name: tool for tool in admin_tools(build_parser())}


class Cluster:
    def __init__(self, cluster: LocalCluster, console: ConsoleServer, shots: Path) -> None:
        self.cluster = cluster
        self.console = console
        self.shots = shots
        self.endpoint = f"http://{cluster.brokers[0].admin_addr}"

    def admin(self, name: str, **arguments: Any) -> Any:
        """What `danube-admin -o json` says, for comparing with the page."""
        return asyncio.run(TOOLS[name].run(self.endpoint, 10.0, arguments)).data

    def owner(self, topic: str) -> str:
        """The broker serving `topic`, once it has one (right after a create or an unload
        the broker answers UNAVAILABLE "being assigned ... retry shortly")."""
        deadline = time.monotonic() + 15
        while True:
            try:
                return str(self.admin("describe_topic", topic=topic)["broker_id"])
            except AdminError as error:
                if "UNAVAILABLE" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def topic_names(self) -> list[str]:
        return [t["name"] for t in self.admin("list_topics", namespace="default")["topics"]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("console-cluster")
    shots = Path(os.environ.get("DANUBE_CONSOLE_SCREENSHOTS") or root / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    with LocalCluster(root / "cluster", ClusterSettings(brokers=3)) as local:
        endpoint = f"http://{local.brokers[0].admin_addr}"
        with ConsoleServer(endpoint) as console:
            yield Cluster(local, console, shots)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(argument)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")
    driver = webdriver.Chrome(
        service=Service(executable_path="/usr/bin/chromedriver"), options=options
    )
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: WebDriver, what: Any, timeout: float = 20.0) -> Any:
    """Until `what` is truthy; a page re-rendering under the check is retried, not a failure."""
    ignored = (StaleElementReferenceException, NoSuchElementException, IndexError, KeyError)
    return WebDriverWait(driver, timeout, 0.2, ignored_exceptions=ignored).until(what)


def open_page(driver: WebDriver, cluster: Cluster, page: str) -> None:
    """Loads `page` afresh and waits until its data is on screen."""
    driver.get(f"{cluster.console.url}/?t={time.monotonic_ns()}#/{page}")
    wait(driver, lambda d: d.find_element(By.ID, "page").get_attribute("data-loaded") == page)
    assert not driver.find_element(By.ID, "error").is_displayed(), error_text(driver)


def error_text(driver: WebDriver) -> str:
    return str(driver.find_element(By.ID, "error").text)


def cells(driver: WebDriver, selector: str, attribute: str) -> list[str]:
    return [
        str(e.get_attribute(attribute)) for e in driver.find_elements(By.CSS_SELECTOR, selector)
    ]


def test_topics_list_describe_and_chart_real_traffic(cluster: Cluster, browser: WebDriver) -> None:
    topic = f"/default/traffic-{uuid.uuid4().hex[:6]}"
    urls = ",".join(cluster.cluster.service_urls)
    producer = subprocess.Popen(
        [CLI, "produce", "-s", urls, "-t", topic, "-m", "hello", "-c", "3000", "-i", "20"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while topic not in cluster.topic_names():
            assert time.monotonic() < deadline, "the producer's topic never appeared"
            time.sleep(0.5)
        consumed = subprocess.run(
            [CLI, "consume", "-s", urls, "-t", topic, "-m", "ui-sub", "-c", "3", "-q"],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        assert consumed.returncode == 0, consumed.stderr
        open_page(browser, cluster, "topics")
        assert sorted(cells(browser, "tr.topic", "data-topic")) == sorted(cluster.topic_names())
        browser.find_element(By.CSS_SELECTOR, f'tr.topic[data-topic="{topic}"]').click()
        owner = wait(browser, lambda d: d.find_element(By.ID, "topic-broker").text)
        assert owner == cluster.owner(topic)
        rows = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.subscription"))
        assert [r.find_element(By.CSS_SELECTOR, "td").text for r in rows] == ["ui-sub"]

        def rate(driver: WebDriver) -> float | None:
            text = driver.find_element(By.ID, "rate-chart-now").text.split()[0]
            return float(text) if float(text) > 0 else None

        assert wait(browser, rate, timeout=30) > 0  # two polls 2 s apart saw messages arrive
        backlog = float(browser.find_element(By.ID, "backlog-chart-now").text.split()[0])
        assert backlog > 0  # ui-sub took 3 messages and left; the producer keeps going
        time.sleep(8)  # a few more polls, so the screenshot shows lines
        browser.save_screenshot(str(cluster.shots / "topics.png"))
        open_page(browser, cluster, "subscriptions")
        assert [
            r.text
            for r in browser.find_elements(By.CSS_SELECTOR, "tr.subscription td:nth-child(2)")
        ] == ["ui-sub"]
        browser.save_screenshot(str(cluster.shots / "subscriptions.png"))
    finally:
        producer.kill()
        producer.wait()


def test_the_overview_shows_the_brokers_leader_and_balance(
    cluster: Cluster, browser: WebDriver
) -> None:
    open_page(browser, cluster, "overview")
    brokers = cluster.admin("list_brokers")["brokers"]
    assert len(brokers) == 3
    assert browser.find_element(By.ID, "broker-count").text == "3"
    assert sorted(cells(browser, "tr.broker", "data-broker-id")) == sorted(
        b["broker_id"] for b in brokers
    )
    assert browser.find_element(By.ID, "leader").text == cluster.admin("get_leader")["leader"]
    shown = browser.find_element(By.ID, "balance-cv").text
    balance = cluster.admin("get_cluster_balance")
    assert shown == f"{balance['coefficient_of_variation']:.3f}"
    counts = {str(b["broker_id"]): str(b["topic_count"]) for b in balance["brokers"]}
    assert counts == {
        row.get_attribute("data-broker-id"): row.find_element(By.CSS_SELECTOR, ".topic-count").text
        for row in browser.find_elements(By.CSS_SELECTOR, "tr.broker")
    }
    browser.find_element(By.ID, "rebalance-dry-run").click()
    result = wait(browser, lambda d: d.find_element(By.ID, "rebalance-result"))
    wait(browser, lambda d: result.is_displayed())
    assert "proposed_moves" in result.text and "moves_executed" in result.text
    browser.save_screenshot(str(cluster.shots / "overview.png"))


def test_delete_through_the_confirmation_dialog_takes_effect(
    cluster: Cluster, browser: WebDriver
) -> None:
    topic = f"/default/doomed-{uuid.uuid4().hex[:6]}"
    cluster.admin("create_topic", topic=topic)
    open_page(browser, cluster, "topics")
    row = f'tr.topic[data-topic="{topic}"]'
    browser.find_element(By.CSS_SELECTOR, row).click()
    wait(browser, lambda d: d.find_element(By.ID, "delete-topic")).click()
    dialog = browser.find_element(By.ID, "confirm")
    wait(browser, lambda d: dialog.is_displayed())
    assert topic in browser.find_element(By.ID, "confirm-text").text
    browser.save_screenshot(str(cluster.shots / "delete-confirmation.png"))
    browser.find_element(By.ID, "confirm-cancel").click()
    wait(browser, lambda d: not dialog.is_displayed())
    time.sleep(1)
    assert topic in cluster.topic_names()  # cancelled: nothing was deleted

    browser.find_element(By.ID, "delete-topic").click()
    wait(browser, lambda d: dialog.is_displayed())
    browser.find_element(By.ID, "confirm-ok").click()
    wait(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, row))
    assert topic not in cluster.topic_names()
    assert browser.find_element(By.ID, "notice").text == "delete_topic: done"


def test_a_refused_action_shows_the_clis_one_line_message(
    cluster: Cluster, browser: WebDriver
) -> None:
    topic = f"/default/gone-{uuid.uuid4().hex[:6]}"
    cluster.admin("create_topic", topic=topic)
    open_page(browser, cluster, "topics")
    browser.find_element(By.CSS_SELECTOR, f'tr.topic[data-topic="{topic}"]').click()
    button = wait(browser, lambda d: d.find_element(By.ID, "delete-topic"))
    cluster.admin("delete_topic", topic=topic)  # behind the page's back
    button.click()
    browser.find_element(By.ID, "confirm-ok").click()
    shown = wait(
        browser, lambda d: error_text(d) if d.find_element(By.ID, "error").is_displayed() else None
    )
    assert shown.startswith(f"delete topic {topic}: ") and "\n" not in shown


def test_schemas_and_namespace_policies_match_the_admin_api(
    cluster: Cluster, browser: WebDriver, tmp_path: Path
) -> None:
    subject = f"orders-{uuid.uuid4().hex[:6]}"
    for title in ("v1", "v2"):  # two versions that differ in their title only (compatible)
        schema = '{"title":"' + title + '","type":"object","properties":{"n":{"type":"integer"}}}'
        cluster.admin("register_schema", subject=subject, schema_type="json_schema", schema=schema)
    open_page(browser, cluster, "schemas")
    subjects = [s["subject"] for s in cluster.admin("list_subjects")["subjects"]]
    assert sorted(cells(browser, "tr.subject", "data-subject")) == sorted(subjects)
    browser.find_element(By.CSS_SELECTOR, f'tr.subject[data-subject="{subject}"]').click()
    definition = wait(browser, lambda d: d.find_element(By.ID, "schema-definition"))
    latest = cluster.admin("get_schema", subject=subject)
    assert latest["version"] == 2 and definition.text == latest["schema_definition"].strip()
    versions = browser.find_elements(By.CSS_SELECTOR, "tr.schema-version")
    assert len(versions) == 2
    versions[0].click()
    first = cluster.admin("get_schema", id=latest["schema_id"], version=1)[
        "schema_definition"
    ].strip()
    wait(browser, lambda d: definition.text == first)
    browser.save_screenshot(str(cluster.shots / "schemas.png"))

    open_page(browser, cluster, "namespaces")
    namespaces = cluster.admin("list_namespaces")["namespaces"]
    assert cells(browser, "tr.namespace", "data-namespace") == namespaces
    policies = cluster.admin("get_namespace_policies", namespace="default")
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#namespaces th")]
    values = [
        td.text for td in browser.find_elements(By.CSS_SELECTOR, 'tr[data-namespace="default"] td')
    ]
    shown = dict(zip(headers, values, strict=True))
    assert {k: str(v) for k, v in policies.items()} == {
        k: v for k, v in shown.items() if k != "namespace"
    }
    browser.save_screenshot(str(cluster.shots / "namespaces.png"))


def test_unload_moves_the_topic_to_another_broker(cluster: Cluster, browser: WebDriver) -> None:
    topic = f"/default/mover-{uuid.uuid4().hex[:6]}"
    cluster.admin("create_topic", topic=topic)
    before = cluster.owner(topic)
    open_page(browser, cluster, "topics")
    browser.find_element(By.CSS_SELECTOR, f'tr.topic[data-topic="{topic}"]').click()
    assert wait(browser, lambda d: d.find_element(By.ID, "topic-broker").text) == before
    browser.find_element(By.ID, "unload-topic").click()
    browser.find_element(By.ID, "confirm-ok").click()

    def moved(driver: WebDriver) -> str | None:
        shown = driver.find_element(By.ID, "topic-broker").text
        return shown if shown not in ("", before) else None

    after = wait(browser, moved)
    assert after == cluster.owner(topic)
    assert not browser.find_element(By.ID, "error").is_displayed(), error_text(browser)


def test_drain_moves_the_brokers_topics_away(cluster: Cluster, browser: WebDriver) -> None:
    """Drain through the dialog, then Activate brings the broker back."""
    topic = f"/default/drained-{uuid.uuid4().hex[:6]}"
    cluster.admin("create_topic", topic=topic)
    owner = cluster.owner(topic)
    open_page(browser, cluster, "overview")
    browser.find_element(
        By.CSS_SELECTOR, f'tr.broker[data-broker-id="{owner}"] button.drain'
    ).click()
    assert owner in browser.find_element(By.ID, "confirm-text").text
    browser.find_element(By.ID, "confirm-ok").click()
    notice = browser.find_element(By.ID, "notice")
    wait(browser, lambda d: notice.is_displayed(), timeout=60)
    assert notice.text == "unload_broker: done", error_text(browser)
    assert cluster.owner(topic) != owner
    admin = {b["broker_id"]: b["broker_status"] for b in cluster.admin("list_brokers")["brokers"]}

    def statuses(driver: WebDriver) -> dict[str, str]:
        return {
            str(row.get_attribute("data-broker-id")): row.find_elements(By.CSS_SELECTOR, "td")[
                1
            ].text
            for row in driver.find_elements(By.CSS_SELECTOR, "tr.broker")
        }

    wait(browser, lambda d: statuses(d) == admin)  # the page reloads the overview after it
    browser.save_screenshot(str(cluster.shots / "drained.png"))
    assert admin[owner] != "active", admin  # drained: not given new topics

    browser.find_element(
        By.CSS_SELECTOR, f'tr.broker[data-broker-id="{owner}"] button.activate'
    ).click()
    wait(browser, lambda d: statuses(d)[owner] == "active")
    assert cluster.admin("list_brokers")["brokers"] and all(
        b["broker_status"] == "active" for b in cluster.admin("list_brokers")["brokers"]
    )
