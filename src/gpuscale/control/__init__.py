"""The control loop gpuscale sits in: HPA and KEDA models (simulation, demo, explain)."""
