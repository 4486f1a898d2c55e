"""The console's page in a real headless Chromium (Debian's chromium and chromedriver, driven by
selenium): log in, approve a pending user, see the devices and topology, and watch a chat
answer from the real model stream in.

STACKD_UPDATE_SCREENSHOTS=1 saves a screenshot of each screen into docs/ (the README shows them).
"""
from __future__ import annotations

import os
import shutil

import pytest

from .test_embedded import call, login

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM = shutil.which("chromium")
WAIT = 120          # generous: a busy machine, a real model


@pytest.fixture(scope="module")
def browser():
    if CHROMEDRIVER is None or CHROMIUM is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed (make test-deps)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1100,2200", "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT)
    yield driver
    driver.quit()


def wait_until(driver, condition, what: str):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(condition, message=what)


def shoot(element_or_driver, name: str, folder) -> None:
    """Into tmp always (proves the screen renders); into docs/ when asked."""
    target = os.path.join(ROOT, "docs") if os.environ.get("STACKD_UPDATE_SCREENSHOTS") == "1" \
        else str(folder)
    os.makedirs(target, exist_ok=True)
    path = os.path.join(target, f"console-{name}.png")
    if hasattr(element_or_driver, "get_screenshot_as_file"):
        assert element_or_driver.get_screenshot_as_file(path)
    else:
        assert element_or_driver.screenshot(path)


def test_log_in_approve_and_chat(browser, embedded_daemon, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    daemon = embedded_daemon
    status, _ = call(daemon.port, "POST", "/api/auth/signup",
                     body={"username": "pat", "password": "password-123"})
    assert status == 201
    browser.get(daemon.url + "/")
    wait_until(browser, lambda d: d.find_element(By.ID, "login-view").is_displayed(), "login form")
    shoot(browser.find_element(By.ID, "login-view"), "login", tmp_path)

    browser.find_element(By.ID, "username").send_keys("admin")
    browser.find_element(By.ID, "password").send_keys(daemon.admin_password)
    browser.find_element(By.ID, "login").click()
    row = wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-user="pat"]'),
                     "pat among the pending users")[0]
    wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#devices td.status-online"),
               "the device online")
    wait_until(browser, lambda d: "leader" in d.find_element(By.ID, "topology-summary").text,
               "the topology")
    shoot(browser.find_element(By.ID, "users-card"), "pending-users", tmp_path)
    shoot(browser.find_element(By.ID, "devices-card"), "devices", tmp_path)
    shoot(browser.find_element(By.ID, "topology-card"), "topology", tmp_path)

    Select(row.find_element(By.CSS_SELECTOR, "select.level")).select_by_value("operator")
    row.find_element(By.CSS_SELECTOR, "button.approve").click()
    wait_until(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, 'tr[data-user="pat"]'),
               "pat leaving the pending list")
    token = login(daemon)
    _, approved = call(daemon.port, "GET", "/api/admin/users?state=approved", token)
    assert {"username": "pat", "level": "operator"}.items() <= \
        next(u for u in approved["data"] if u["username"] == "pat").items()

    wait_until(browser, lambda d: [o for o in Select(d.find_element(By.ID, "chat-model")).options
                                   if o.get_attribute("value") == "smollm2-135m-instruct"],
               "the device's chat model")
    # record every change of the answer as it renders: a streamed answer grows in steps
    browser.execute_script("""
        window.__lengths = [];
        const answer = document.getElementById('chat-answer');
        new MutationObserver(() => window.__lengths.push(answer.textContent.length))
            .observe(answer, {childList: true, characterData: true, subtree: true});""")
    browser.find_element(By.ID, "chat-send").click()
    wait_until(browser, lambda d: d.find_element(By.ID, "chat-answer").get_attribute("data-done"),
               "the end of the answer")
    answer = browser.find_element(By.ID, "chat-answer").text
    lengths = [n for n in browser.execute_script("return window.__lengths") if n]
    assert answer.strip() and browser.find_element(By.ID, "chat-message").text == ""
    assert len(set(lengths)) >= 3, lengths          # it appeared piece by piece, not at once
    shoot(browser.find_element(By.ID, "chat-card"), "chat", tmp_path)
