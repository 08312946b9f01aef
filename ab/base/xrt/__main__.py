"""`python -m xrt ...`: see `xrt.cli.main`."""

from xrt.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
