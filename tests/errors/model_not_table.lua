-- gpt takes a table; "gpt { }" in this comment is not the call
return gpt "tiny"
