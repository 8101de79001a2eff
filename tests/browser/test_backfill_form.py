"""The ledgerbatch_backfill trigger form in a real browser: Debian's headless Chromium driven by Playwright,
against a real Airflow api-server (its own home and SQLite metadata database, the repo's dags/ and pipelines/).

Nothing here skips: without /usr/bin/chromium (scripts/setup.sh installs it as root with apt) or the
`playwright` package the test fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ledgerbatch.processes import free_port
from ledgerbatch.processes import stop_group

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
USER, PASSWORD = "admin", "form-test"
TITLES = {"topic": "Topic", "partitions": "Partitions", "from_offset": "From offset", "until_offset": "Until offset",
          "from_time": "From time", "until_time": "Until time"}  # the optional params and their titles


def _airflow(env: dict, *args: str) -> None:
    done = subprocess.run([str(Path(sys.executable).parent / "airflow"), *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"airflow {' '.join(args)}: {done.stderr[-3000:]}"


def ui_env(home: Path, pipelines_dir: Path, ledger: dict) -> dict:
    """The environment of an Airflow home with the repo's DAGs over `pipelines_dir`, signed in as USER."""
    (home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "LEDGERBATCH_PIPELINES_DIR": str(pipelines_dir),
        "AIRFLOW_CONN_LEDGERBATCH_DB": json.dumps(ledger),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }


@contextmanager
def api_server(env: dict) -> Iterator[str]:
    """A real api-server on a free port over `env`'s home, its DAGs serialized into its database; its base URL."""
    home = Path(env["AIRFLOW_HOME"])
    _airflow(env, "db", "migrate")
    _airflow(env, "dags", "reserialize")  # the form is drawn from the serialized DAG: no scheduler needed
    port = free_port()
    log = (home / "api-server.log").open("w")
    server = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "api-server", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None, (home / "api-server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "api-server did not come up: " + (home / "api-server.log").read_text()[-3000:]
            time.sleep(0.5)
        yield base
    finally:
        stop_group(server, 20)
        log.close()


@pytest.fixture(scope="module")
def airflow_ui(tmp_path_factory):
    """The api-server over the repo's pipelines; yields its base URL. Parsing reads nothing from the ledger's
    connection but the asset URI (host, port, database): no server is contacted."""
    env = ui_env(tmp_path_factory.mktemp("airflow-ui"), REPO / "pipelines",
                 {"conn_type": "postgres", "host": "127.0.0.1", "port": 5432, "login": "postgres",
                  "schema": "ledgerbatch_form"})
    with api_server(env) as base:
        yield base


@contextmanager
def signed_in_page(base: str, next_path: str, height: int, timeout_ms: int) -> Iterator:
    """A page of headless Chromium signed in to the api-server at `base`, opened at `next_path`."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run scripts/setup.sh as root (apt-get install chromium)"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": height})
            page.set_default_timeout(timeout_ms)
            page.goto(f"{base}/auth/login?next={urllib.parse.quote(next_path, safe='')}")
            page.get_by_label("Username").fill(USER)
            page.get_by_label("Password").fill(PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"**{next_path}")
            yield page
        finally:
            browser.close()


@pytest.fixture
def page(airflow_ui):
    with signed_in_page(airflow_ui, "/dags/ledgerbatch_backfill", 2000, 30_000) as page:
        yield page


def _open_form(page):
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog").filter(has_text="Trigger Dag - ledgerbatch_backfill")
    dialog.get_by_text("Run Parameters").wait_for()
    dialog.get_by_text("Dry run").wait_for()
    return dialog


def _field(dialog, label: str):
    """The form row of a param, found by its title."""
    return dialog.locator("[data-scope=field][data-part=root]").filter(
        has=dialog.page.locator("label", has_text=label))


def _errors(dialog) -> list[str]:
    """What the form shows as invalid: the error icon beside a section title ("Run Parameters" turns red with
    it while a param is invalid), chakra error texts and alerts, fields marked invalid, and optional params
    the form marks required."""
    found = []
    for section in dialog.locator("[data-testid=config-form] [data-part=item-trigger]").all():
        if section.locator(".chakra-icon").count():
            found.append(f"error icon at {section.inner_text().strip()!r}")
    found += [t.strip() for t in dialog.locator("[data-part=error-text], [role=alert]").all_inner_texts() if t.strip()]
    invalid = dialog.locator("[aria-invalid=true], [data-invalid]").count()
    found += [f"{invalid} fields marked invalid"] if invalid else []
    for label in TITLES.values():
        if _field(dialog, label).locator("label[data-required]").count():
            found.append(f"{label} marked required")
    return found


def test_backfill_form_opens_valid_with_every_optional_field_empty(page, tmp_path):
    dialog = _open_form(page)
    page.wait_for_timeout(500)  # let the form validate its initial values
    screenshot = tmp_path / "backfill-form.png"
    page.screenshot(path=str(screenshot), full_page=True)
    print(f"screenshot: {screenshot}")

    assert _errors(dialog) == []
    submit = dialog.get_by_test_id("trigger-dag-submit")
    assert submit.is_enabled()
    # Every optional field empty: text and number inputs blank, partitions the empty list, no time picked.
    assert dialog.locator("input[name=element_topic]").input_value() == ""
    numbers = dialog.locator("input[role=spinbutton]")
    assert numbers.count() == 2 and [numbers.nth(i).input_value() for i in range(2)] == ["", ""]
    for label in ("From time", "Until time"):  # date-time pickers, nothing picked
        assert _field(dialog, label).get_by_test_id("datetime-input").inner_text() == "Select date and time"
    assert dialog.locator("input[name=element_pipeline]").input_value() == "orders"


def test_backfill_form_sends_empty_fields_as_null_and_picked_times_replay_can_read(page, tmp_path):
    from ledgerbatch.plan.replay import request_from_params
    from ledgerbatch.spec.pipeline import load_spec

    dialog = _open_form(page)
    for label, day in (("From time", "1"), ("Until time", "2")):  # the 1st and the 2nd of the shown month
        _field(dialog, label).get_by_test_id("datetime-input").click()
        picker = page.get_by_role("dialog").last  # the picker's popover
        picker.get_by_role("button", name=day, exact=True).first.click()
        dialog.get_by_text("Trigger Dag - ledgerbatch_backfill").click()  # close the popover
    page.wait_for_timeout(300)
    page.screenshot(path=str(tmp_path / "backfill-form-times.png"), full_page=True)
    assert _errors(dialog) == []
    picked = [_field(dialog, label).get_by_test_id("datetime-input").inner_text() for label in ("From time", "Until time")]
    assert "Select date and time" not in picked, picked

    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/dags/ledgerbatch_backfill/dagRuns")) as sent:
        dialog.get_by_test_id("trigger-dag-submit").click()
    conf = sent.value.post_data_json["conf"]
    assert sent.value.response().status in (200, 201), sent.value.response().text()
    assert conf["pipeline"] == "orders" and conf["dry_run"] is True
    assert all(not conf.get(key) for key in ("topic", "partitions", "from_offset", "until_offset")), conf

    request = request_from_params(load_spec(REPO / "pipelines", "orders"), conf)
    assert request.topic == "orders" and request.partitions is None  # empty: the only topic, every partition
    assert request.from_offset is None and request.until_offset is None
    assert request.from_time_ms < request.until_time_ms
