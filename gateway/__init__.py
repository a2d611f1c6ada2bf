"""The fencegate HTTP gateway: locks with fencing tokens in front of fenced storage."""

from gateway.app import create_app
from gateway.client import FencegateClient
from gateway.config import Config, ConfigError, load_config

__all__ = ["Config", "ConfigError", "FencegateClient", "create_app", "load_config"]
