"""What every benchmark shares: worker groups timed in rounds, network namespaces, test clusters."""
