"""The pipeline's consumer roles (router, deliver, retry), each a handler on the one consumer
loop, and the worker that runs them in one process.
"""
