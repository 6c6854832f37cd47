"""The census of the messages the software stack prints around distributed training failures:
data (messages.jsonl) and the code that checks it against the rules and writes its page."""
