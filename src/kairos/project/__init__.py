"""The composition root: a project folder and its `kairos.yaml` become one `Runtime`, the one
place every part (stores, sources, models, the gateway, the decision log) is built and
closed. The client faces (kairos.client) sit above it; the engine and stores below."""
