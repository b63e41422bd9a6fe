"""Console pages: each file is a Streamlit page script registered by ``agentobs.console.shell.PAGES``."""
