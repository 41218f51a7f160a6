"""Torch building blocks shared by the methods: small pure loss functions and encoders.

Modules here import torch at import time; ``crossview.nn`` itself stays cheap to import.
"""
