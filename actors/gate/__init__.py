"""The PolicyActor: the gate's decisions and a person's answers."""
