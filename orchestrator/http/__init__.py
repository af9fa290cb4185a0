"""The HTTP face: the API, its event stream and the web page.

Imports any room below it; nothing below imports it.
"""
