"""Configuration as plain data: frozen dataclasses decoded strictly from YAML.

- `decode`      strict decoding with key paths in every error, `ConfigError`
- `ranges`      the declared range of every numeric field and its one checker
- `yamlload`    YAML loading that refuses duplicate keys
- `schema`      the gateway config (`GatewayConfig`), `load_config`, `parse_config`
- `access`, `admission`, `discovery`, `state`: sections of it, one module each
- `scheduling`  the routing section: plugin specs, profiles, the active policy

Nothing here imports the rest of the gateway (tests/test_architecture.py):
plugin specs are checked against the registry by `gateway.scheduling.validate`.
"""
