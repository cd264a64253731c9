#!/usr/bin/env python3
"""The dashboard in a real browser (Debian's chromium, driven by playwright).

  dashboard_test.py BASE_URL ADMIN_TOKEN SCREENSHOT_DIR UPTIME_FROM UPTIME_TO

Checks the fleet view against the seeded state, search from the keyboard, the pool and endpoint
views (timeline and transitions), availability and incidents over the uptime fixture's day
(the figures the API and CLI tests check too; a 10-second ejection visible in 24 h; a bar zoomed
into from the keyboard), an operator action signed in from the page, and that the
change it makes appears on another open page without a reload. Writes screenshots; prints the
figures as JSON; exits non-zero with the reason when a check fails.
"""
import json
import os
import re
import sys
import time

from playwright.sync_api import sync_playwright, expect

base, admin, shots, up_from, up_to = sys.argv[1:6]
os.makedirs(shots, exist_ok=True)
figures = {}
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ.get("VITALS_CHROMIUM", "/usr/bin/chromium"), args=["--no-sandbox"])
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # Every request a page makes is answered (the browser's own /favicon.ico included: it was
    # a 404 on every load).
    missing = []
    page.on("response", lambda r: missing.append(f"{r.status} {r.url}") if r.status == 404 else None)

    # The fleet: the seeded pools, the ejected endpoint counted, 10,000 bulk endpoints rendered.
    page.goto(base + "/")
    # A desktop browser asks for /favicon.ico on every load (headless Chromium does not).
    icon = page.request.get(base + "/favicon.ico")
    assert icon.status == 204, icon.status
    row = page.locator('#fleet tr[data-pool="dash"]')
    expect(row).to_be_visible(timeout=15000)
    expect(row.locator('td[data-count="unhealthy"]')).to_contain_text("unhealthy 1")
    expect(row.locator('td[data-count="healthy"]')).to_contain_text("healthy 2")
    page.wait_for_function("document.body.dataset.firstRenderMs !== undefined")
    figures["first_render_ms"] = int(page.evaluate("document.body.dataset.firstRenderMs"))
    figures["fleet_rows"] = page.locator("#fleet tbody tr").count()
    assert figures["fleet_rows"] >= 1001, figures
    expect(page.locator("#main")).to_contain_text("10127 endpoints")
    # A pool larger than a page: counted in full, listed a page at a time.
    wide = page.locator('#fleet tr[data-pool="wide"]')
    expect(wide.locator("td").nth(1)).to_have_text("120")
    expect(wide.locator('td[data-count="unhealthy"]')).to_contain_text("unhealthy 20")
    page.screenshot(path=f"{shots}/fleet.png", full_page=False)

    # Search from the keyboard: "/" focuses it; the fleet narrows to the match.
    page.keyboard.press("/")
    page.keyboard.type("dash")
    expect(page.locator("#fleet tbody tr")).to_have_count(1)
    page.keyboard.press("Control+a")
    page.keyboard.press("Backspace")

    page.goto(base + "/#/pools/wide")
    expect(page.locator("#pool tbody tr")).to_have_count(50)
    expect(page.locator("#more")).to_contain_text("50 of 120 endpoints listed")
    expect(page.locator("#counts")).to_contain_text("unhealthy 20")
    page.locator("#more button").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#pool tbody tr")).to_have_count(120)
    expect(page.locator("#more")).to_have_count(0)
    # Availability over the fixture's day: the same figures as the API and `vitals report`.
    page.goto(f"{base}/#/pools/up?from={up_from}&to={up_to}")
    expect(page.locator("#pool-availability")).to_have_text("100.000 %")
    expect(page.locator("#pool-all")).to_have_text("99.294 %")
    expect(page.locator('#uptime-endpoints tr[data-endpoint="a"] .availability')).to_have_text("99.306 %")
    expect(page.locator("#uptime-endpoints tbody tr").first).to_have_attribute("data-endpoint", "a")
    # Request availability beside it (the fixture's calls): the pool 240 of 340, c half of 60.
    expect(page.locator("#pool-requests")).to_have_text("70.588 % of 340 calls succeeded")
    expect(page.locator('#uptime-endpoints tr[data-endpoint="c"] .requests')).to_have_text("50.000 %")
    expect(page.locator('#uptime-endpoints tr[data-endpoint="a"] .calls')).to_have_text("120")
    expect(page.locator("#pool-request-bars .bar").first).to_have_attribute(
        "aria-label", re.compile(r"00:00 UTC: 100\.000 % in rotation, 28\.571 % of 70 calls succeeded"))
    expect(page.locator("#pool-request-bars .bar").first).to_have_class(re.compile("a1"))
    expect(page.locator("#pool-request-bars .bar").nth(1)).to_have_attribute("aria-label", re.compile("no calls"))
    expect(page.locator("#incidents tbody tr")).to_have_count(2)
    expect(page.locator('#incidents tr[data-endpoint="b"]')).to_contain_text("10.0 s")
    expect(page.locator('#incidents tr[data-endpoint="a"]')).to_contain_text("ejected, readmitted")
    # d was first seen at noon: its lane starts half way, nothing drawn before (it was drawn
    # healthy from midnight).
    d_first = page.locator('#lanes tr[data-endpoint="d"] rect').first
    assert 370 <= float(d_first.get_attribute("x")) <= 390, d_first.get_attribute("x")
    expect(page.locator('#lanes tr[data-endpoint="d"] svg')).to_have_attribute("aria-label", re.compile("first seen"))
    # The 10-second ejection of b is visible in the 24 h lane, labelled, with b's state now.
    blip = page.locator('#lanes tr[data-endpoint="b"] rect[data-state="unhealthy"]')
    expect(blip).to_have_count(1)
    figures["ten_second_ejection_px"] = blip.bounding_box()["width"]
    assert figures["ten_second_ejection_px"] >= 3, figures
    expect(page.locator('#lanes tr[data-endpoint="b"] td').nth(2)).to_contain_text("healthy")
    page.screenshot(path=f"{shots}/uptime.png", full_page=True)
    # Zoom from the keyboard: b's 05:00 bar, Enter: that hour, where b was in rotation 3590 s.
    bar = page.locator('#uptime-endpoints tr[data-endpoint="b"] .bar').nth(5)
    expect(bar).to_have_attribute("aria-label", re.compile(r"05:00 UTC: 99\.722 % in rotation, 55\.556 % of 45 calls succeeded"))
    bar.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#uptime h3").first).to_contain_text("05:00 UTC → ")
    expect(page.locator('#uptime-endpoints tr[data-endpoint="b"] .availability')).to_have_text("99.722 %")
    expect(page.locator("#incidents tbody tr")).to_have_count(1)

    page.goto(base + "/#/")
    expect(page.locator('#fleet tr[data-pool="dash"]')).to_be_visible()

    # The pool, reached by keyboard from the fleet.
    page.locator('#fleet a[href="#/pools/dash"]').focus()
    page.keyboard.press("Enter")
    e1 = page.locator('#pool tr[data-endpoint="e1"]')
    expect(e1.locator('[data-state="unhealthy"]')).to_contain_text("✖ unhealthy")
    page.screenshot(path=f"{shots}/pool.png")

    # An endpoint: its timeline and transitions with their reasons.
    other = ctx.new_page()
    other.on("pageerror", lambda e: errors.append(str(e)))
    other.goto(base + "/#/pools/dash/endpoints/e1")
    expect(other.locator("#transitions tbody tr").first).to_contain_text("ejected")
    assert other.locator("#timeline svg rect").count() >= 2, "a span before and after the ejection"
    other.screenshot(path=f"{shots}/endpoint.png", full_page=True)

    # An operator action from the page, signed in; the pool page open in the first tab shows the
    # change without a reload.
    other.goto(base + "/#/pools/dash/endpoints/e2")
    # The same document changes view: wait for e2's page before using its form.
    expect(other.locator("#main h2")).to_contain_text("dash / e2")
    other.fill("#token", admin)
    other.click("text=Sign in")
    expect(other.locator("#action")).to_be_visible()
    other.select_option("#action", "force_unhealthy")
    other.fill("#reason", "from the dashboard test")
    other.click("text=Apply")
    expect(other.locator("#result")).to_contain_text("accepted", timeout=10000)
    t0 = time.monotonic()
    e2 = page.locator('#pool tr[data-endpoint="e2"] [data-state="unhealthy"]')
    # The figure is reported; the wait is generous so that a busy machine does not fail it.
    expect(e2).to_be_visible(timeout=20000)
    figures["live_update_ms"] = int((time.monotonic() - t0) * 1000)
    expect(page.locator("#counts")).to_contain_text("unhealthy 2")
    # The availability section of a range that ends now follows the live stream too: e2's lane
    # ends in the state the table shows (it stayed as loaded before).
    expect(page.locator('#lanes tr[data-endpoint="e2"] rect[data-state="unhealthy"]')).to_have_count(1, timeout=20000)
    page.screenshot(path=f"{shots}/pool-after-action.png")
    assert not errors, errors
    assert not missing, missing
    browser.close()
print(json.dumps(figures))
