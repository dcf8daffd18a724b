"""The Kafka shell: client configs and topics, the one consumer loop, the producers that count
acknowledgements, the topic readers, Avro codecs and the Schema Registry, the config topic, and the
embedded development broker. Imports the core and the runtime, never HTTP.
"""
