"""The review's pages and routes: projects and their exports, a review's page, the
audio a review heard, each project's reference track (agentbox.review.app mounts
them on the engine's pages)."""
