"""What the browser tests' scripts share (tests/ui/check.py, tests/ui/cors.py): plain HTTP calls
from the test itself, outside the browser, and bounded waits."""

import sys
import time
import urllib.error
import urllib.request


def http_call(method, url, headers=None, body=None, timeout=30):
    """(status, body text); an HTTP error status is an answer, not an exception."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_until(what, check, timeout=30.0):
    """Polls `check` every 100 ms until it holds; fails after `timeout` seconds. A connection
    refused or reset counts as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (urllib.error.URLError, ConnectionError):
            pass  # not up yet
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def run(main):
    """Runs a check script's `main`: a failed expectation prints `FAILED: …` and exits 1."""
    try:
        main()
    except AssertionError as error:
        print(f"FAILED: {error}", file=sys.stderr)
        sys.exit(1)
