"""Untrusted input made safe where it lands: bounded reads of outside files, user text in Markdown."""
