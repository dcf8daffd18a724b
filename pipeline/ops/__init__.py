"""Jobs over Kafka that commands and the admin API start: sending calls from a file, dead-letter
listing and replay, deletion requests, audience syncs. Imports the core and the Kafka shell.
"""
