module github.com/synapsebroker/synapse

go 1.26.8

require go.uber.org/zap v1.28.0

require go.uber.org/multierr v1.10.0 // indirect
