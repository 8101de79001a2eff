"""Every ledgerbatch form in a real browser (Debian's headless Chromium driven by Playwright, against a real
Airflow api-server: the fixture of test_backfill_form.py): what the form can know it refuses at Trigger,
with a 400 shown in the dialog and no run; what it sends, the tasks can read (airflow/forms.py).

The tasks' own refusals and outcomes (one line, no retry; the dry run's line) run through dag.test() in
tests/integration/test_airflow.py, and as a person sees them in the browser in test_outcomes.py."""
from __future__ import annotations

import pytest

from .test_backfill_form import CHROMIUM, CHROMIUM_ARGS, PASSWORD, REPO, USER, _field, airflow_ui  # noqa: F401


@pytest.fixture(scope="module")
def signed_in(airflow_ui):  # noqa: F811
    """A browser context signed in once for the module's tests."""
    from pathlib import Path

    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run scripts/setup.sh as root (apt-get install chromium)"
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = chromium.new_context(viewport={"width": 1400, "height": 2000})
            page = context.new_page()
            page.goto(f"{airflow_ui}/auth/login?next=%2Fdags")
            page.get_by_label("Username").fill(USER)
            page.get_by_label("Password").fill(PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url("**/dags")
            page.close()
            yield context
        finally:
            chromium.close()


@pytest.fixture
def browser(signed_in):
    """A fresh page of the signed-in context: no dialog or toast of an earlier test in the way."""
    page = signed_in.new_page()
    page.set_default_timeout(60_000)  # the machine is shared: a slow answer is not a refusal
    yield page
    page.close()


def _open_form(page, base: str, dag_id: str):
    page.goto(f"{base}/dags/{dag_id}")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog").filter(has_text=f"Trigger Dag - {dag_id}")
    dialog.get_by_text("Run Parameters").wait_for()
    return dialog


def _trigger(page, dialog, dag_id: str):
    """Click Trigger; the API's answer to the form's POST."""
    with page.expect_response(lambda r: r.request.method == "POST"
                              and r.url.endswith(f"/dags/{dag_id}/dagRuns")) as answer:
        dialog.get_by_test_id("trigger-dag-submit").click()
    return answer.value


def _refused(page, dialog, dag_id: str, param: str, shot) -> None:
    """Trigger answered 400, the dialog naming the param, and the dialog still open (no run)."""
    response = _trigger(page, dialog, dag_id)
    assert response.status == 400, response.text()
    dialog.get_by_text(f"Invalid input for param {param}").wait_for()
    page.screenshot(path=str(shot), full_page=True)
    assert dialog.is_visible()


def test_backfill_form_refuses_a_negative_offset_instead_of_clamping_it(browser, airflow_ui, tmp_path):  # noqa: F811
    dialog = _open_form(browser, airflow_ui, "ledgerbatch_backfill")
    numbers = dialog.locator("input[role=spinbutton]")
    numbers.nth(0).fill("-5")
    numbers.nth(1).fill("10")
    dialog.get_by_text("Trigger Dag - ledgerbatch_backfill").click()  # blur: where the form used to clamp
    assert numbers.nth(0).input_value() == "-5"
    _refused(browser, dialog, "ledgerbatch_backfill", "from_offset", tmp_path / "backfill-negative.png")


def test_backfill_form_sends_partitions_typed_as_text_and_refuses_a_json_list(browser, airflow_ui, tmp_path):  # noqa: F811
    from ledgerbatch.airflow.forms import replay_request
    from ledgerbatch.spec.pipeline import load_spec

    dialog = _open_form(browser, airflow_ui, "ledgerbatch_backfill")
    partitions = dialog.locator("input[name=element_partitions]")
    assert partitions.count() == 1  # a plain text input, not a code editor
    partitions.fill("[0]")
    numbers = dialog.locator("input[role=spinbutton]")
    numbers.nth(0).fill("0")
    numbers.nth(1).fill("10")
    _refused(browser, dialog, "ledgerbatch_backfill", "partitions", tmp_path / "backfill-json-partitions.png")

    partitions.fill("0, 2-3")
    response = _trigger(browser, dialog, "ledgerbatch_backfill")
    assert response.status in (200, 201), response.text()
    conf = response.request.post_data_json["conf"]
    assert conf["partitions"] == "0, 2-3" and conf["dry_run"] is True
    request = replay_request(load_spec(REPO / "pipelines", "orders"), conf)
    assert request.partitions == (0, 2, 3) and (request.from_offset, request.until_offset) == (0, 10)


def test_offsets_form_opens_with_a_default_that_runs(browser, airflow_ui, tmp_path):  # noqa: F811
    from ledgerbatch.airflow.forms import move_request

    dialog = _open_form(browser, airflow_ui, "ledgerbatch_offsets")
    assert dialog.locator("input[name=element_to]").input_value() == "latest"
    dialog.locator("input[name=element_by]").fill(" ")
    dialog.locator("input[name=element_reason]").fill("INC-7")
    _refused(browser, dialog, "ledgerbatch_offsets", "by", tmp_path / "offsets-blank-by.png")

    dialog.locator("input[name=element_by]").fill("alice")
    browser.screenshot(path=str(tmp_path / "offsets-form.png"), full_page=True)
    response = _trigger(browser, dialog, "ledgerbatch_offsets")
    assert response.status in (200, 201), response.text()
    conf = response.request.post_data_json["conf"]
    assert (conf["to"], conf["dry_run"], conf["to_time"]) == ("latest", True, None)
    assert move_request(conf).target.latest


def test_history_form_refuses_a_time_it_cannot_read_and_offers_no_date_backfill(browser, airflow_ui, tmp_path):  # noqa: F811
    dialog = _open_form(browser, airflow_ui, "ledgerbatch_history")
    assert dialog.locator("input[type=radio][value=backfill]").is_disabled()  # allowed_run_types leaves it out
    dialog.locator("input[name=element_compact_before]").fill("30 days")
    _refused(browser, dialog, "ledgerbatch_history", "compact_before", tmp_path / "history-bad-time.png")
