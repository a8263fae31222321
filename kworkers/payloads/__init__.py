"""Typed payloads: record values (and keys) through deserializers and serializers, a schema
registry's failures told apart (``failures``), and the registry settings operators give.

The submodules that import confluent-kafka's schema registry client (the ``registry`` extra) are
imported by name, never from here: importing this package loads no client library.
"""
