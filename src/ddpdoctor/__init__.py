"""ddpdoctor: why a distributed PyTorch job failed, hung or crawled, who is to blame, and
what to change."""

__version__ = "0.1.0"
