"""`python -m ddpdoctor`."""

from ddpdoctor.cli.main import main

main()
