"""The DistributedStrategy: its schema, field rules, files and generated reference."""
