"""Untrusted input made safe where it lands: bounded reads of outside files, user text in Markdown;
files replaced whole, never through a planted link."""
