// Pins prometheus-operator for its CRDs only (ServiceMonitor, PrometheusRule): gpuscale's
// manifests carry both, and ./dev cluster applies the manifests as they are. Nothing of
// it is built; the CRD YAML is read from the module cache.
// Pins prometheus-operator for its CRDs only (ServiceMonitor, PrometheusRule): gpuscale's
// manifests carry both, and ./dev cluster applies the manifests as they are. Nothing of
// it is built; the CRD YAML is read from the module cache.
module gpuscale.local/cluster/prometheus-operator

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.85.0 // indirect
