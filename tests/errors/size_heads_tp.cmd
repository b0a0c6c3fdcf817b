gpt3_175b --tp 5
