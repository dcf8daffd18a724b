"""The HTTP shell: the webhook sender, the ingestion API (and its admin endpoints), the test
receiver. Imports the layers below it, never the roles or the commands.
"""
