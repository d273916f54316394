"""The quickstart (`make demo`) and its generated toy language pair."""
