"""Agent code against the OpenAI client shape: the client, the chat endpoint's shared parts,
tool-call parsing, the workflow that runs an agent function, and example agents."""
