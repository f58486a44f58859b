"""`python -m asyncgrpo_trainer --job-spec FILE`: the driver the head pod runs."""

from __future__ import annotations

import sys

from asyncgrpo_trainer import driver

if __name__ == "__main__":
    sys.exit(driver.main())
