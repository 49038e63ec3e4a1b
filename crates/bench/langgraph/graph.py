"""The graph `agentrt-bench --only langgraph` serves from LangGraph's
in-memory Agent Server: one node that sends the thread's messages to an
OpenAI-compatible chat model and stores its answer.

The model is the bench's timed fake upstream, the same one the agentrt
scenarios stream from: `AGENTRT_BENCH_FAKE_URL` is its base URL
(`http://127.0.0.1:PORT/v1`), set by the bench when it starts the server.
The fake answers each request as the ticket named by the last user message
says (first-token time, tokens/s, token count), so both runtimes see the
same upstream. Streaming is on, so the server's `messages-tuple` stream
mode relays every token as its own event; no retries, so a failed request
shows as a failed run instead of a slower one.
"""

import os

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph

model = ChatOpenAI(
    model="fake",
    base_url=os.environ["AGENTRT_BENCH_FAKE_URL"],
    api_key="not-a-key",
    streaming=True,
    max_retries=0,
    timeout=120,
)


async def answer(state: MessagesState) -> dict:
    reply = await model.ainvoke(state["messages"])
    return {"messages": [reply]}


builder = StateGraph(MessagesState)
builder.add_node("answer", answer)
builder.add_edge(START, "answer")
builder.add_edge("answer", END)
graph = builder.compile()
