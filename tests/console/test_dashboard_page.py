"""The dashboard in a real headless Chromium, against real daemons: under load its charts gain
points (read from the page), a killed follower turns red, a `user` gets no dashboard, and after
the console restarts the charts open with the history the database kept.

STACKD_UPDATE_SCREENSHOTS=1 saves the dashboard's screenshots into docs/.
"""
from __future__ import annotations

import threading
import time

import pytest

from stackd.console.dashboard.samples import NAMES
from testing.cluster_nodes import Node, eventually, statuses
from testing.console_embedded import NO_MODELS, EmbeddedDaemon
from testing.console_harness import Harness
from testing.daemon import http_request

from .test_embedded import call, login
from .test_web_page import WAIT, browser, shoot, wait_until  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"


def log_in(driver, url: str, username: str, password: str) -> None:
    from selenium.webdriver.common.by import By
    driver.get(url + "/")
    driver.execute_script("sessionStorage.clear()")
    driver.get(url + "/")
    wait_until(driver, lambda d: d.find_element(By.ID, "login-view").is_displayed(), "login form")
    driver.find_element(By.ID, "username").send_keys(username)
    driver.find_element(By.ID, "password").send_keys(password)
    driver.find_element(By.ID, "login").click()
    wait_until(driver, lambda d: d.find_element(By.ID, "app-view").is_displayed(), "the app")


def chart(driver, device_id: str, name: str) -> dict:
    """What the page shows in one chart: its data attributes (points, values, nonzero, gaps)."""
    return driver.execute_script(
        "const e = document.querySelector(`[data-device='${arguments[0]}'] [data-chart='${arguments[1]}']`);"
        "return e ? {...e.dataset} : null;", device_id, name) or {}


def number(found: dict, key: str) -> float:
    return float(found.get(key) or 0)


class Load:
    """`clients` threads asking the node for completions until stopped."""

    def __init__(self, port: int, key: str, clients: int):
        self.port, self.key = port, key
        self.going = True
        self.answered = 0
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(clients)]
        for thread in self.threads:
            thread.start()

    def run(self) -> None:
        while self.going:
            status, _, _ = http_request("127.0.0.1", self.port, "POST", "/v1/chat/completions", key=self.key,
                                        body={"model": MODEL, "max_tokens": 24, "messages": [
                                            {"role": "user", "content": "Count from one to twenty."}]})
            assert status == 200
            self.answered += 1

    def stop(self) -> None:
        self.going = False
        for thread in self.threads:
            thread.join(WAIT)


def test_charts_gain_points_under_load(browser, embedded_daemon, tmp_path):
    from selenium.webdriver.common.by import By

    daemon = embedded_daemon
    token = login(daemon)
    status, listing = call(daemon.port, "GET", "/api/devices", token)
    device = listing["data"][0]
    log_in(browser, daemon.url, "admin", daemon.admin_password)
    # the landing page: the cluster and the device's panel come first
    wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"[data-device='{device['id']}'] .chart"),
               "the device's charts")
    load = Load(daemon.ports["inference"], daemon.admin_key, clients=2)
    try:
        wait_until(browser, lambda d: number(chart(d, device["id"], "tokens"), "nonzero") >= 3,
                   "three points of generated tokens/s")
        first = number(chart(browser, device["id"], "tokens"), "values")
        wait_until(browser, lambda d: number(chart(d, device["id"], "tokens"), "values") > first,
                   "the chart gaining points while it is open")
        wait_until(browser, lambda d: number(chart(d, device["id"], "ttft"), "values") >= 1, "a TTFT point")
        wait_until(browser, lambda d: number(chart(d, device["id"], "kv"), "nonzero") >= 1, "KV cache in use")
    finally:
        load.stop()
    assert load.answered > 0
    for name in ("requests", "memory", "temperature", "power", "itl"):
        assert number(chart(browser, device["id"], name), "points") > 0, name
    panel = browser.find_element(By.CSS_SELECTOR, f"article[data-device='{device['id']}']")
    wait_until(browser, lambda d: panel.find_elements(By.CSS_SELECTOR, f".models tr[data-model='{MODEL}']"),
               "the model's row")
    status, recent = call(daemon.port, "GET", f"/api/devices/{device['id']}/requests", token)
    assert status == 200
    if recent["recording"]:                 # the node records once its daemon wires the recorder
        wait_until(browser, lambda d: panel.find_elements(By.CSS_SELECTOR, ".requests tbody tr"),
                   "recent requests")
        row = panel.find_element(By.CSS_SELECTOR, ".requests tbody tr").text
        assert MODEL in row and "Count from one" not in row
    leader = wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "g.node-leader"), "the leader")[0]
    assert "node-ok" in leader.get_attribute("class")
    shoot(browser.find_element(By.ID, "cluster-card"), "cluster", tmp_path)
    shoot(panel, "dashboard", tmp_path)


def test_a_user_below_viewer_gets_no_dashboard(browser, tmp_path):
    from selenium.webdriver.common.by import By

    harness = Harness(str(tmp_path / "console"))
    try:
        harness.add_device("seen-by-viewers")
        harness.add_user("plain-user", "user")
        user = harness.login("plain-user", "password-123")["access_token"]
        assert harness.call("GET", "/api/cluster", user)[0] == 403
        log_in(browser, f"http://127.0.0.1:{harness.port}", "plain-user", "password-123")
        wait_until(browser, lambda d: d.find_element(By.ID, "devices-card").is_displayed(), "the devices")
        assert not browser.find_element(By.ID, "dashboard-card").is_displayed()
        assert not browser.find_element(By.ID, "cluster-card").is_displayed()
        assert not browser.find_elements(By.CSS_SELECTOR, ".device-panel")
        assert browser.find_element(By.ID, "dashboard-card").get_attribute("data-polls") is None
    finally:
        harness.close()


def test_killing_a_follower_turns_its_node_red_within_a_poll(browser, tmp_path):
    from selenium.webdriver.common.by import By

    leader = Node(str(tmp_path / "leader"))
    follower = Node(str(tmp_path / "follower"), role="follower", leader=leader.cluster_url)
    harness = None
    try:
        eventually(lambda: statuses(leader).get(follower.node_id) == "up")
        harness = Harness(str(tmp_path / "console"))
        admin = harness.admin_token()
        devices = {}
        for node in (leader, follower):
            status, _, devices[node.node_id] = harness.call("POST", "/api/devices", admin, {
                "name": node.node_id, "inference_url": f"http://127.0.0.1:{node.inference_port}",
                "cluster_url": node.cluster_url, "api_key": node.admin_key})
            assert status == 201
        log_in(browser, f"http://127.0.0.1:{harness.port}", "admin", harness.admin_password)
        red = f"g.node-degraded[data-node='{follower.node_id}']"
        wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"g.node-ok[data-node='{follower.node_id}']"),
                   "the follower drawn, healthy")
        assert browser.find_elements(By.CSS_SELECTOR, f"g.node-leader[data-node='{leader.node_id}']")
        follower.kill()
        eventually(lambda: statuses(leader).get(follower.node_id) == "down")
        polls = int(browser.find_element(By.ID, "dashboard-card").get_attribute("data-polls"))
        wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, red), "the follower red")
        # the console samples every 2 s and the page asks every 2 s: the leader's word shows by
        # the page's next poll after the console's next sample, never later
        assert int(browser.find_element(By.ID, "dashboard-card").get_attribute("data-polls")) <= polls + 3
        reasons = browser.find_element(By.CSS_SELECTOR, "#clusters ul.reasons").text
        assert f"node {follower.node_id} is down" in reasons
        follower_device = devices[follower.node_id]["id"]
        wait_until(browser, lambda d: d.find_elements(
            By.CSS_SELECTOR, f"article.unreachable[data-device='{follower_device}']"), "its panel marked")
        wait_until(browser, lambda d: number(chart(d, follower_device, "memory"), "gaps") >= 1,
                   "a gap on its charts")
        shoot(browser.find_element(By.ID, "cluster-card"), "cluster-degraded", tmp_path)
    finally:
        if harness is not None:
            harness.close()
        follower.kill()
        leader.kill()


def test_the_page_opens_with_history_after_the_console_restarts(browser, tmp_path):
    from selenium.webdriver.common.by import By

    data_dir = str(tmp_path / "data")
    daemon = EmbeddedDaemon(data_dir, NO_MODELS)
    try:
        token = login(daemon)
        device_id = call(daemon.port, "GET", "/api/devices", token)[1]["data"][0]["id"]

        def sampled():
            status, body = call(daemon.port, "GET", f"/api/devices/{device_id}/metrics", token)
            memory = NAMES.index("memory_used_mb") + 1
            return status == 200 and len([s for s in body["samples"] if s[memory] is not None]) >= 3
        eventually(sampled)
    finally:
        assert daemon.stop() == 0
    stopped = time.time()
    daemon = EmbeddedDaemon(data_dir, NO_MODELS)
    try:
        log_in(browser, daemon.url, "admin", daemon.admin_password)
        memory = wait_until(browser, lambda d: chart(d, device_id, "memory").get("first") and
                            chart(d, device_id, "memory"), "the memory chart")
        # its first point is older than this console process: it came from the database
        assert float(memory["first"]) < stopped and number(memory, "values") >= 1
        assert browser.find_element(By.ID, "dashboard-card").get_attribute("data-polls")
    finally:
        assert daemon.stop() == 0
